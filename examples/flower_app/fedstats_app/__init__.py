"""A Flower App that runs fedstats models on a real federation."""
