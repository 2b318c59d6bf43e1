import { readdir, readFile, readlink } from 'node:fs/promises';

/**
 * The local TCP ports of the sockets process `pid` has open (Linux: its
 * /proc/<pid>/fd links to `socket:[inode]`, matched in /proc/net/tcp and tcp6).
 * A server's list of its clients (Redis' CLIENT LIST `addr`) names each
 * client by this port, so a test can tell one process's connections from
 * every other's without guessing by time of arrival.
 */
export async function localPortsOf(pid: number): Promise<Set<number>> {
  const inodes = new Set<string>();
  for (const fd of await readdir(`/proc/${pid}/fd`)) {
    const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
    const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
    if (inode) inodes.add(inode);
  }
  const ports = new Set<number>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = await readFile(table, 'utf8').catch(() => '');
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      // sl, local_address (hex ip:port), rem_address, st, tx:rx, tr:when, retrnsmt, uid, timeout, inode
      if (cols.length > 9 && inodes.has(cols[9])) ports.add(parseInt(cols[1].split(':')[1], 16));
    }
  }
  return ports;
}
