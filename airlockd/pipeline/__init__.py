"""The pure core: one module per stage. No pygls, no docker, no HTTP: paths and data only."""
