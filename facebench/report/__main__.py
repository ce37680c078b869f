"""python -m facebench.report: facebench/report/build.py."""

from facebench.report.build import main

main()
