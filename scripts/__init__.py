"""Developer scripts: async_to_sync.py generates the sync clients from the asyncio ones,
dump_schema.py the engine's schema dump, gen_reference.py the references of docs/reference/."""
