"""python -m facebench.advise: see facebench/advise/__init__.py."""

from facebench.advise.run import main

main()
