"""The standalone site's settings plus values set in code, as a host project sets its own: a JSON
object of names and values in the environment variable CODE_SETTINGS. The environment alone cannot
make such values (the standalone site parses what it reads there), so only this reaches the checks
that guard settings made in code."""

import json
import os

from config.settings import *  # noqa: F403

globals().update(json.loads(os.environ.get("CODE_SETTINGS", "{}")))
