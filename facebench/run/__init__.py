"""One job, from the command line to its record: the entry point and its signals, the job's
setup, the epoch loop, the emulated accelerator, the model's step, ranks per host, and the runner
that measures and records.

May import: tracking, measure, loaders and every room below them.
"""
