"""`python -m static_keras.cli`."""

import sys

from static_keras.cli import main

sys.exit(main())
