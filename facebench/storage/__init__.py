"""Data in an object store: s3:// addresses, credentials, the client every loader's reads go
through and the requests it counts, and a local S3-compatible server to try it all against.

May import: config, errors, stages, results, host.
"""
