"""This machine and this process: cores, memory and cgroup limits, /dev/shm, the page cache, the
device, the job's ranks, child processes, loopback ports, paths, files written whole, and
progress lines.

May import: config, errors.
"""
