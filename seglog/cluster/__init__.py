"""The node: its HTTP server, the wire protocol, and (with replication) cluster metadata."""
