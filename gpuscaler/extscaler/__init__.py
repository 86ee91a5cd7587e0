"""KEDA's External Scaler gRPC service, served by `gpuscaler run` (how KEDA uses it:
docs/keda.md). The answers are a pure function of the controller's latest plan
(`gpuscaler.core.external`); this package only holds the latest floors (`board`), answers
gRPC (`service`) and assembles it into `run` (`attach`).
"""
