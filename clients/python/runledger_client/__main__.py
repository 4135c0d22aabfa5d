import sys

from runledger_client.cli import main

sys.exit(main())
