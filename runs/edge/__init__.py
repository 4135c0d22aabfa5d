"""The SSE edge (DESIGN §10): Pushpin holds the clients' streams in front of the web processes.

    grip.py       the GRIP protocol Runledger speaks: Grip-Sig, hold headers, publish items
    hold.py       the answer to a stream request that came through Pushpin: replay + hold
    publisher.py  the publisher every web process runs, one of them leading: table -> Pushpin
    control.py    its side of each Pushpin's control port: bodies in order, sent again, recover
    pushpin.py    Pushpin's configuration and its foreground run (`bin/edge`, `manage.py runedge`)

Without `RUNLEDGER_GRIP_URL` none of it runs: the stream view looks at that one setting and
serves its own stream, and no publisher starts.
"""
