"""The kubelet pod-resources API v1, generated Python (messages and gRPC stub).

Source: `api.proto` here is a verbatim copy of kubernetes/kubelet
`pkg/apis/podresources/v1/api.proto` at commit 63b3249724f7d89a8aa48f9acb3811f193c9aa68
(2026-07-23; the same file as kubernetes/kubernetes
`staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`). Its package is `v1`, so
the method on the wire is `/v1.PodResourcesLister/List`, as the kubelet serves it.

Generated with grpcio-tools 1.85.1 (protobuf gencode 7.35.1), from the repository root:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \\
        gpuscaler/adapters/kubelet_pb/api.proto

`api_pb2*.py` are generated: not edited, not linted (pyproject excludes them).
"""
