"""What kubectl asks a Kubernetes API server before and beside the objects themselves:
discovery (`discovery`), OpenAPI v3 (`openapi`) and server-side tables (`tables`), each
derived from the kinds' declarations (`events.api.kinds.declared`), never from a table kept
by hand; reads at a resourceVersion (`versions`) and watches from any resourceVersion
(`watch`). The HTTP read API (`projections.http`) routes to them.
"""
