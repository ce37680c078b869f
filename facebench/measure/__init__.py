"""What an epoch measures besides its clock: the meter's rates, CPU and memory use, each batch's
timeline, the samples' order, and that each sample came exactly once.

May import: host, loaders and the rooms below them (stages, data, shards).
"""
