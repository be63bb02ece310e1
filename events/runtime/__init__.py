"""What every virtbus process runs with: structlog set-up, asyncio helpers, the garbage
collector's settings. Imports nothing of virtbus."""
