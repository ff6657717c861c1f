"""`python -m kvmem` runs the CLI."""

from kvmem.cli import main

main()
