import { hash } from 'node:crypto';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The namespaces in use are a handful of constants: their bytes are kept once parsed. */
const namespaces = new Map<string, Buffer>();
function namespaceBytes(namespace: string): Buffer {
  let bytes = namespaces.get(namespace);
  if (bytes === undefined) {
    if (!UUID.test(namespace)) throw new TypeError(`namespace is not a UUID: ${namespace}`);
    bytes = Buffer.from(namespace.replaceAll('-', ''), 'hex');
    if (namespaces.size < 64) namespaces.set(namespace, bytes);
  }
  return bytes;
}

/** RFC 9562 name-based UUID, version 5 (SHA-1). */
export function uuidV5(name: string, namespace: string): string {
  const ns = namespaceBytes(namespace);
  const nameBytes = Buffer.from(name, 'utf8');
  // One-shot hash() of the two concatenated: about half the CPU of createHash().update().update().digest().
  const digest = hash('sha1', Buffer.concat([ns, nameBytes], ns.length + nameBytes.length), 'buffer');
  digest[6] = (digest[6] & 0x0f) | 0x50;
  digest[8] = (digest[8] & 0x3f) | 0x80;
  const hex = digest.subarray(0, 16).toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function isUuid(value: string): boolean {
  return UUID.test(value);
}
