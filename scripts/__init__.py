"""Developer scripts: scripts/async_to_sync.py generates the sync client from the asyncio one."""
