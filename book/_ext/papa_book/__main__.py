import sys

from .build import main

sys.exit(main())
