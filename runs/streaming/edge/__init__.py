"""The SSE edge (docs/design/edge.md#how): Pushpin holds the clients' streams in front of the web processes.
    grip.py        the GRIP Runledger speaks: Grip-Sig, hold headers, publish items
    hold.py        a client's connect through Pushpin, and Pushpin's fetches of its link
    link.py        the token that authorises those fetches: one run, user and credential, expiring
    publisher.py   the publisher each web process runs, one leading: table -> Pushpin
    control.py     its side of each Pushpin's control socket: publish in order, send again, sync
    endings.py     the runs whose end it published, closed again for a stream held after
    revocation.py  the revocations sent to the publisher, which closes that user's streams
    pushpin.py     Pushpin's configuration and its foreground run (`bin/edge`, `manage.py runedge`)
Without `RUNLEDGER_GRIP_URL` none of it runs.
"""
