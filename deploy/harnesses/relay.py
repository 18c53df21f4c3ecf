"""A TCP relay: listens on LISTEN_HOST:LISTEN_PORT, forwards every connection to
TARGET_HOST:TARGET_PORT. run.sh uses it to bridge the proxy (on the host's
loopback) into a harness's network namespace. Standard library only."""
import asyncio
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def main(listen_host, listen_port, target_host, target_port):
    async def handle(client_r, client_w):
        try:
            up_r, up_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, listen_host, listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    lh, lp, th, tp = sys.argv[1:5]
    asyncio.run(main(lh, int(lp), th, int(tp)))
