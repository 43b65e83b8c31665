import sys

from swajax.cli import main

sys.exit(main())
