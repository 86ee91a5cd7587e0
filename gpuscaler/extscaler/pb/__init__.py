"""KEDA's External Scaler API, generated Python (messages, servicer and stub).

Source: `externalscaler.proto` here is a verbatim copy of kedacore/keda
`pkg/scalers/externalscaler/externalscaler.proto` at commit
8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a (2026-08-20; the file last changed in
82ac584704fc7e12efc5140a7c70a716186630a7). KEDA is Apache-2.0. Its package is
`externalscaler`, so the methods on the wire are `/externalscaler.ExternalScaler/...`,
as KEDA's Go client calls them.

Generated with grpcio-tools 1.85.1 (protobuf gencode 7.35.1), from the repository root:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \\
        gpuscaler/extscaler/pb/externalscaler.proto

`externalscaler_pb2*.py` are generated: not edited, not linted (pyproject excludes them).
"""
