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

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     control.py     The publisher's side of each Pushpin's control socket
#     endings.py     The runs whose end the edge's publisher published
#     grip.py        GRIP, the little of it Runledger speaks with Pushpin
#     hold.py        The streams the edge holds
#     link.py        The link token of a stream the edge holds
#     publisher.py   The edge's publisher: every committed event, from the events table to each
#                    Pushpin
#     pushpin.py     Pushpin in the foreground, with a configuration of its own
#     revocation.py  Revocations the edge's streams must not wait for
