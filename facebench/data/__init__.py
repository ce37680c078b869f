"""The two face datasets in their real layouts, their labels, and the synthetic stand-in.

May import: storage, host, stages, config, errors.
"""
