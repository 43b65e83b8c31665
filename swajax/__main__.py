import sys

from swajax.cli.main import main

sys.exit(main())
