"""``python -m infra.service start|status|stop|reset``."""

import sys

from infra.service.actor import main

sys.exit(main())
