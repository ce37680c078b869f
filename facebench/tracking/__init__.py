"""Where a run's record goes: MLflow (the store, its views, the tracker that survives a lost
server) and who owns a run still open.

May import: host, results and the modules below them.
"""
