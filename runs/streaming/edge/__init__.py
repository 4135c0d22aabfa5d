"""The SSE edge (docs/design/edge.md#how): Pushpin holds the clients' streams in front of the web processes.

    grip.py       the GRIP protocol Runledger speaks: Grip-Sig, hold headers, publish items
    hold.py       a client's connect through Pushpin, and Pushpin's fetches of its link: replay + hold
    link.py       the token that authorises those fetches: one run, one user, one credential, expiring
    publisher.py  the publisher every web process runs, one of them leading: table -> Pushpin
    revocation.py the revocations sent to the publisher (a deactivated user, a deleted token, a
                  logout), which closes that user's streams at once
    control.py    its side of each Pushpin's control socket (only its user can reach it): publish
                  in order, send again, sync
    endings.py    the runs whose end it published: remembered a while, and closed again a few
                  seconds later for a stream held after the first close
    pushpin.py    Pushpin's configuration and its foreground run (`bin/edge`, `manage.py runedge`)

Without `RUNLEDGER_GRIP_URL` none of it runs: the stream view looks at that one setting and
serves its own stream, and no publisher starts.
"""
