"""The SSE edge (docs/design/edge.md#how): Pushpin holds the clients' streams in front of the web
processes. Without `RUNLEDGER_GRIP_URL` none of it runs: the stream view looks at that one setting
and serves its own stream, and no publisher starts.

Modules (docs/hooks/reference.py --write keeps this index):

    control.py     The publisher's side of each Pushpin's control socket
    endings.py     The runs whose end the edge's publisher published
    grip.py        GRIP, the little of it Runledger speaks with Pushpin
    hold.py        The streams the edge holds
    link.py        The link token of a stream the edge holds
    publisher.py   The edge's publisher: every committed event, from the events table to each
                   Pushpin
    pushpin.py     Pushpin in the foreground, with a configuration of its own (`bin/edge`,
                   `manage.py runedge`)
    revocation.py  Revocations the edge's streams must not wait for
"""
