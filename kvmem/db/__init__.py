"""The database: the tables (`tables`), the engine and its sessions (`engine`), SQLite's
bare write connection (`driver_connection`), the migrations run from code (`migrate`) and a
user's erasure across every table (`erasure`)."""
