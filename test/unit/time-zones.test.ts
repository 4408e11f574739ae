/**
 * Site time zones (domain/users.ts isIanaTimeZone; docs/decisions/sites.md "Time zones"): every IANA name
 * the runtime's ICU database knows, canonical or alias, spelled as the tz database spells it; never offsets,
 * unknown names or other letter cases. The rollout maintenance windows and the agent's process schedules
 * read stored zones with the same rule.
 */
import { isIanaTimeZone } from '../../domain/users';

describe('isIanaTimeZone', () => {
  it('accepts canonical names and the aliases ICU does not list (current names among them)', () => {
    for (const tz of [
      'UTC',
      'Europe/Berlin',
      'Etc/GMT+5',
      'Asia/Kolkata',
      'Asia/Calcutta',
      'Europe/Kyiv',
      'Europe/Kiev',
      'America/Argentina/Buenos_Aires',
      'America/Buenos_Aires',
      'Etc/UTC',
      'GMT',
      'US/Eastern',
      ...Intl.supportedValuesOf('timeZone'),
    ]) {
      expect([tz, isIanaTimeZone(tz)]).toEqual([tz, true]);
    }
  });

  it('refuses offsets, unknown names and other spellings, whatever the runtime makes of them', () => {
    for (const tz of [
      '',
      '+05:30',
      '-05:00',
      '+0530',
      'UTC+05:30',
      'GMT+5',
      'garbage',
      'Mars/Olympus',
      'Europe/Nowhere',
      'europe/berlin',
      'EUROPE/BERLIN',
      'asia/kolkata',
      'utc',
      'Europe/Berlin ',
      'Europe//Berlin',
      `Europe/${'X'.repeat(60)}`,
    ]) {
      expect([tz, isIanaTimeZone(tz)]).toEqual([tz, false]);
    }
  });
});
