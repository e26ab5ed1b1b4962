# The demo tasks' own unittest files fail by design (each task ships a bug). Keep pytest from collecting
# them if someone points it at workers/ instead of tests/.
collect_ignore_glob = ["tasks/*"]
