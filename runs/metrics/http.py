"""HTTP requests by status, counted around the whole ASGI application (runs.asgi): every
answer, the body guard's 413s and the static files included, at no database cost."""

from typing import Any

from runs.metrics import series


class CountResponses:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_counting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                series.http_response(message["status"])
            await send(message)

        await self.app(scope, receive, send_counting)
