/*
 * The "ours" side of the api side-by-side bench: the real api, exactly as
 * apps/api/src/main.ts serves it (configured by the environment). Started
 * through this file rather than main.ts itself only so that its command line
 * does not match a `pkill -f apps/api/...` of another process's clean-up on
 * a shared machine (a bench run lost its api to a SIGTERM that way).
 */
import '../../../apps/api/src/main';
