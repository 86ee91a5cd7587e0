"""The scheduler extender: memory- and NUMA-aware Filter, Score and Bind for kube-scheduler."""
