"""Pre-built shards: the manifest that vouches for them, and how they are built.

A shard set is a folder of shard files plus `manifest.json`, written last. The manifest names every
shard with its sample count, size and sha256, and fingerprints the source files and the settings
that produced them; without a complete manifest a folder is not a shard set.

May import: data, storage, host, results, stages, config, errors.
"""
