"""The API's schemas (KubeVirt's, HCO's, Kubernetes' objects as msgspec Structs), their
admission rules, every kind's declaration (`kinds`), and the errors bad input is refused
with. Imports nothing of virtbus above it."""
