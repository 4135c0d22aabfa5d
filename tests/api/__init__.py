"""The REST API: requests and answers, authentication, tokens, throttles, CORS, bounded answers, hostile input."""
