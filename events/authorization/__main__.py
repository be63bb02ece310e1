"""`python -m events.authorization`: the NATS accounts of a policy (`accounts.main`)."""

import sys

from events.authorization.accounts import main

sys.exit(main())
