"""`kvmem eval`: the scenarios (`suite`, the built-in one in `suite.yaml`), running them
(`run`) and what is printed (`report`)."""
