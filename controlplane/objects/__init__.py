"""Any declared kind with no handlers of its own: its objects are kept as applied; and the
`patch` of every kind `apply` admits (`controlplane.objects.patch`)."""
