"""The two face datasets in their real layouts, their labels, and the synthetic stand-in.

May import: host, stages, config, errors.
"""
