"""The node agent (`gpuscaler agent`), a DaemonSet on GPU nodes and a sibling of the
controller: it applies the node's time-slice label with nvidia-smi, publishes the GPU
topology, maps pods to GPUs (kubelet pod-resources), and kills GPU processes that evicted
pods left behind, then lifts preemption's `gpu-memory-held` quarantine.
"""
