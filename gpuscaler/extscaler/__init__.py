"""KEDA's External Scaler gRPC service, served by `gpuscaler run`.

A ScaledObject adds a trigger `type: external` (or `external-push`) whose scalerAddress is
gpuscaler's Service; KEDA then asks gpuscaler for the forecast floor as a metric and the
HPA it owns takes the max over all triggers, so the user's reactive triggers keep the
ceiling and nothing patches the user's object. The answers are a pure function of the
controller's latest plan (`gpuscaler.core.external`); this package only holds the latest
floors (`board`), answers gRPC (`service`) and assembles it into `run` (`attach`).
"""
