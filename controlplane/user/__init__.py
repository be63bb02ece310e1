"""The user's side: the Python client and the `virtbus` CLI, apart from the server's modules.

They speak only the wire (`events`) and read models (`projections`); nothing here is imported
by the control plane itself.
"""
