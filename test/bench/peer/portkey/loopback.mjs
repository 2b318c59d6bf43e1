/*
 * Preloaded into the Portkey gateway (node --import ./loopback.mjs): its Node
 * server listens on every interface (it gives no host to listen()); the bench
 * binds it to loopback, as it does every server it starts.
 */
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'object' && args[0] !== null && args[0].host === undefined)
    args[0] = { ...args[0], host: '127.0.0.1' };
  else if (typeof args[0] === 'number' && (args[1] === undefined || typeof args[1] === 'function'))
    args.splice(1, args[1] === undefined ? 1 : 0, '127.0.0.1');
  return listen.apply(this, args);
};
