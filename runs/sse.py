"""The SSE stream of a run's events (DESIGN §5). Arrives with the SSE issue."""

from django.http import HttpRequest, HttpResponse


async def run_stream(request: HttpRequest, run_id: str) -> HttpResponse:
    return HttpResponse(status=501)
