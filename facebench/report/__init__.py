"""A sweep's runs read back: the comparison table, its Markdown and chart, the summary printed at
a sweep's end, and how many accelerators a host feeds.

`python -m facebench.report` runs facebench/report/build.py. May import: run and every room below
it (it needs tracking's store, the loaders' names and the stages).
"""
