/*
 * The api and the gateway floor (with FLOOR_FEATURES, on FLOOR_PORT) in one
 * process, for gateway-peers' BENCH_FLOOR_IN_OURS side: the floor's calls
 * served where ours' code and heap are loaded (the api serves nothing
 * meanwhile), so what a plain handler would cost inside ours, and what is left
 * between the two is per-call work rather than the size of the process.
 */
import './ours';
import './gateway-floor';
