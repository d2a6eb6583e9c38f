"""`python -m engine.core`: a pod's engine core process (see engine.core.process)."""

import sys

from engine.core.process import main

sys.exit(main())
