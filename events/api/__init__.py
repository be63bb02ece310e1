"""The API's schemas (KubeVirt's, HCO's, Kubernetes' objects as msgspec Structs), their
admission rules, and the errors bad input is refused with. Imports nothing of virtbus."""
