"""``python experiments/collect.py <table> <sweep dir>``: a sweep's runs as a paper table (see
:mod:`spp.experiments.collect`)."""

from spp.experiments.collect import main

if __name__ == "__main__":
    main()
