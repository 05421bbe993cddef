#!/usr/bin/env node
// A rhea client with a URL list, for the connect-bound tests (docs/lifecycle.md section 11): it connects
// to the first URL, then to the next on every reconnect (rhea's own delays), and prints how long it took
// to have an AMQP connection open.
//
//   node url_list.js --urls amqp://H1:P1,amqp://H2:P2 [--connect-timeout MS] [--idle-time-out MS] [--timeout S]
//
// --connect-timeout MS: each attempt that has no open connection after MS milliseconds is given up (its
// socket destroyed; rhea then reconnects to the next URL): rhea has no such option, so a `connect`
// function in connection_details does it.  0 (default): rhea alone.  --idle-time-out MS: rhea's
// idle_time_out (0: none).  Credentials: HASTANDBY_USER/HASTANDBY_PASSWORD (SASL PLAIN).  Prints one JSON
// line {"opened": URL, "seconds": S, "attempts": N} and exits 0, or {"error": ...} and exits 1 after
// --timeout seconds (default 10); 2 on a bad command line.
'use strict';

const net = require('net');
const rhea = require('rhea');

function parse(argv) {
  const options = { urls: '', 'connect-timeout': 0, 'idle-time-out': 0, timeout: 10 };
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    const value = argv[i + 1];
    if (!(name in options) || value === undefined) throw new Error(`unknown option or missing value: ${argv[i]}`);
    options[name] = name === 'urls' ? value : Number(value);
  }
  if (!options.urls) throw new Error('--urls is required');
  return options;
}

function run(options) {
  const urls = options.urls.split(',').map((text) => new URL(text));
  const started = process.hrtime.bigint();
  const seconds = () => Number(process.hrtime.bigint() - started) / 1e9;
  let attempts = 0;
  let current;  // the URL of the attempt under way
  let bound;  // its timer, with --connect-timeout

  const connect = (port, host, socketOptions, callback) => {
    const socket = net.connect(port, host, callback);
    if (options['connect-timeout'] > 0) {
      bound = setTimeout(() => socket.destroy(new Error(`no open within ${options['connect-timeout']} ms`)),
                         options['connect-timeout']);
    }
    return socket;
  };
  const details = () => {
    current = urls[attempts % urls.length];
    attempts += 1;
    clearTimeout(bound);
    return { host: current.hostname, port: Number(current.port) || 5672, connect, options: {} };
  };

  const container = rhea.create_container();
  container.on('connection_open', (context) => {
    clearTimeout(bound);
    process.stdout.write(JSON.stringify({ opened: current.href, seconds: seconds(), attempts }) + '\n');
    context.connection.close();
    process.exit(0);
  });
  container.on('disconnected', () => {});  // rhea reconnects; without a listener it would warn on stderr
  container.on('connection_error', () => {});
  setTimeout(() => {
    process.stdout.write(JSON.stringify({ error: `no connection open after ${options.timeout} s`, attempts }) + '\n');
    process.exit(1);
  }, options.timeout * 1000).unref();
  container.connect({
    connection_details: details,
    username: process.env.HASTANDBY_USER, password: process.env.HASTANDBY_PASSWORD,
    idle_time_out: options['idle-time-out'] || undefined,
  });
}

let options;
try {
  options = parse(process.argv.slice(2));
} catch (error) {
  process.stderr.write(`url_list.js: ${error.message}\n`);
  process.exit(2);
}
run(options);
