import pytest
import trio_asyncio

pytest_plugins = [
    "tests.support.postgres",
    "tests.support.s3",
    "tests.support.nodes",
    "tests.support.cluster",
]


@pytest.fixture
async def aio_loop():
    """The trio_asyncio loop a node opens once at start-up; storage tests need it too."""
    async with trio_asyncio.open_loop() as loop:
        yield loop
