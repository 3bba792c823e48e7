"""``python -m infra.service start|stop|reset|status|...``: the service's command line (:mod:`infra.service.cli`)."""

import sys

from infra.service.cli import main

sys.exit(main())
